"""The command line both case scripts share: run the named case_* functions
of the calling script, each followed by its check_alive(), printing
"ok CASE" after each.

    run_cases(globals(), parser)   # parser: argparse with the script's options

sets the script's ARGS to the parsed options before the first case runs.
"""

import sys


def run_cases(scope, parser):
    cases = {k[5:]: v for k, v in scope.items() if k.startswith("case_")}
    parser.add_argument("cases", nargs="+", help="|".join(sorted(cases)))
    args = parser.parse_args()
    scope["ARGS"] = args
    for name in args.cases:
        if name not in cases:
            sys.exit("unknown case %r (known: %s)" % (name, ", ".join(sorted(cases))))
        cases[name]()
        scope["check_alive"]()
        print("ok", name, flush=True)
