use super::*;

fn err(r: Result<impl std::fmt::Debug>) -> String {
    format!("{:#}", r.unwrap_err())
}

#[test]
fn config_full_parses() {
    let c = Config::parse(
        r#"
socket = "/tmp/x.sock"
tcp = ":10810"
read_only = true
max_request = "1M"
stages = ["stats"]
default_export = "b"
fuse = ["/m/b.img", "a=/m/a.img"]
metrics = "127.0.0.1:9100"
pidfile = "/tmp/x.pid"
[[export]]
name = "a"
backend = "memory:1G"
[[export]]
name = "b"
backend = "null:1G"
read_only = true
stages = ["delay:all=1ms"]
"#,
    )
    .unwrap();
    assert_eq!(c.exports.len(), 2);
    assert_eq!(c.max_request.clone().unwrap().bytes("m").unwrap(), 1 << 20);
    assert!(c.read_only);
    assert_eq!(c.fuse, vec!["/m/b.img".to_string(), "a=/m/a.img".into()]);
    assert_eq!(c.metrics.as_deref(), Some("127.0.0.1:9100"));
    assert_eq!(c.pidfile, Some(PathBuf::from("/tmp/x.pid")));
}

#[test]
fn config_errors_name_the_field() {
    let e = Config::parse("sockett = \"/x\"").unwrap_err().to_string();
    assert!(e.contains("sockett"), "{e}");
    let e = Config::parse("[[export]]\nname=\"a\"\nbackend=\"memory:1G\"\nbogus=1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("bogus"), "{e}");
    let e = err(Config::parse("max_request = \"12Q\""));
    assert!(e.contains("max_request"), "{e}");
    let e = err(Config::parse("max_request = 10"));
    assert!(e.contains("max_request"), "{e}");
    let e = err(Config::parse("[[export]]\nname=\"a\"\nbackend=\"nocolon\""));
    assert!(e.contains("export[0].backend"), "{e}");
    let e = err(Config::parse(
        "[[export]]\nname=\"a\"\nbackend=\"null:1G\"\n[[export]]\nname=\"a\"\nbackend=\"null:1G\"",
    ));
    assert!(e.contains("export[1].name"), "{e}");
    let e = err(Config::parse("tcp = \"host:notaport\""));
    assert!(e.contains("tcp"), "{e}");
    let e = err(Config::parse("default_export = \"zz\""));
    assert!(e.contains("default_export"), "{e}");
    let e = err(Config::parse("threads = 0"));
    assert!(e.contains("threads"), "{e}");
    let e = err(Config::parse("metrics = \"nohostport\""));
    assert!(e.contains("metrics"), "{e}");
    let e = err(Config::parse("fuse = [\"\"]"));
    assert!(e.contains("fuse[0]"), "{e}");
    let e = err(Config::parse("fuse = \"/m/x.img\""));
    assert!(e.contains("fuse"), "a string where a list belongs: {e}");
}

#[test]
fn tcp_addresses() {
    assert_eq!(parse_tcp_addr(":1234").unwrap(), ("127.0.0.1".into(), 1234));
    assert_eq!(
        parse_tcp_addr("0.0.0.0").unwrap(),
        ("0.0.0.0".into(), 10809)
    );
    assert_eq!(parse_tcp_addr("h:5").unwrap(), ("h".into(), 5));
    assert_eq!(parse_tcp_addr("[::1]:7").unwrap(), ("::1".into(), 7));
    assert_eq!(parse_tcp_addr("[::1]").unwrap(), ("::1".into(), 10809));
    assert_eq!(parse_tcp_addr("::1").unwrap(), ("::1".into(), 10809));
    assert_eq!(parse_tcp_addr("").unwrap(), ("127.0.0.1".into(), 10809));
    assert!(parse_tcp_addr("h:99999").is_err());
    assert!(parse_tcp_addr("h:x").is_err());
    assert!(parse_tcp_addr("[::1").is_err());
    assert_eq!(show_tcp_addr(&("::1".into(), 7)), "[::1]:7");
    assert_eq!(show_tcp_addr(&("h".into(), 7)), "h:7");
}

#[test]
fn settings_defaults() {
    let s = Settings::merge(&Flags::default(), &Config::default()).unwrap();
    assert_eq!(s.exports.len(), 1);
    assert_eq!(s.exports[0].name, "");
    assert_eq!(s.exports[0].backend, DEFAULT_BACKEND);
    assert_eq!(s.socket, Some(PathBuf::from(DEFAULT_SOCKET)));
    assert_eq!(s.tcp, None);
    assert_eq!(s.max_request, 32 << 20);
    assert_eq!(s.poll_us, DEFAULT_POLL);
    assert_eq!(s.coalesce_us, DEFAULT_COALESCE_US);
    assert_eq!(s.threads, 2);
    assert!(s.fuse.is_empty());
    assert_eq!(s.metrics, None);
    assert_eq!(s.pidfile, None);
}

#[test]
fn settings_merge() {
    let a = Flags::default();
    let cfg = Config {
        poll_us: Some(PollSetting::Fixed(0)),
        ..Default::default()
    };
    assert_eq!(
        Settings::merge(&a, &cfg).unwrap().poll_us,
        PollSetting::Fixed(0),
        "poll_us = 0 turns it off"
    );
    let a0 = Flags {
        poll_us: Some(PollSetting::Fixed(7)),
        ..Default::default()
    };
    assert_eq!(
        Settings::merge(&a0, &cfg).unwrap().poll_us,
        PollSetting::Fixed(7),
        "the flag beats the file"
    );
    let cfg = Config {
        coalesce_us: Some(0),
        ..Default::default()
    };
    assert_eq!(
        Settings::merge(&Flags::default(), &cfg)
            .unwrap()
            .coalesce_us,
        0
    );
    let a0 = Flags {
        coalesce_us: Some(20),
        ..Default::default()
    };
    assert_eq!(Settings::merge(&a0, &cfg).unwrap().coalesce_us, 20);

    let a = Flags {
        exports: vec!["a=memory:1M".into(), "b=null:1M".into()],
        default_export: Some("b".into()),
        tcp: Some(":0".into()),
        read_only: true,
        ..Default::default()
    };
    let s = Settings::merge(&a, &Config::default()).unwrap();
    assert_eq!(s.exports.len(), 2);
    assert!(s.exports.iter().all(|e| e.read_only));
    assert_eq!(s.socket, None, "--tcp alone means TCP only");
    assert_eq!(s.tcp, Some(("127.0.0.1".into(), 0)));
    let a = Flags {
        tcp: Some(String::new()),
        ..Default::default()
    };
    assert_eq!(
        Settings::merge(&a, &Config::default()).unwrap().tcp,
        Some((DEFAULT_TCP_HOST.into(), DEFAULT_TCP_PORT)),
        "--tcp without a value"
    );
}

#[test]
fn settings_exports_and_stages_merge() {
    let cfg = Config::parse(
        r#"
stages = ["stats"]
[[export]]
name = "f"
backend = "memory:1M"
stages = ["delay:all=1ms"]
description = "from the file"
"#,
    )
    .unwrap();
    let a = Flags {
        backend: Some("null:1M".into()),
        exports: vec!["x=memory:2M".into()],
        stages: vec!["cache:size=1M".into()],
        ..Default::default()
    };
    let s = Settings::merge(&a, &cfg).unwrap();
    let names: Vec<&str> = s.exports.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["", "x", "f"], "flags' exports first");
    assert_eq!(s.exports[0].stages, ["cache:size=1M", "stats"]);
    assert_eq!(s.exports[1].backend, "memory:2M");
    assert_eq!(
        s.exports[2].stages,
        ["cache:size=1M", "stats", "delay:all=1ms"]
    );
    assert_eq!(s.exports[2].description.as_deref(), Some("from the file"));
    let dup = Flags {
        exports: vec!["f=null:1M".into()],
        ..Default::default()
    };
    assert!(err(Settings::merge(&dup, &cfg)).contains("given twice"));
    let other = Flags {
        default_export: Some("f".into()),
        exports: vec!["x=null:1M".into()],
        ..Default::default()
    };
    assert_eq!(
        Settings::merge(&other, &cfg)
            .unwrap()
            .default_export
            .as_deref(),
        Some("f"),
        "--default-export may name an export of the file"
    );
}

#[test]
fn settings_fuse_metrics_pidfile_from_file_and_flags() {
    let cfg = Config::parse(
        r#"
fuse = ["/m/d.img", "b=/m/b.img"]
metrics = "127.0.0.1:9100"
pidfile = "/tmp/file.pid"
[[export]]
name = ""
backend = "memory:1M"
[[export]]
name = "b"
backend = "memory:1M"
"#,
    )
    .unwrap();
    let s = Settings::merge(&Flags::default(), &cfg).unwrap();
    let got: Vec<(&str, &Path)> = s
        .fuse
        .iter()
        .map(|f| (f.export.as_str(), f.file.as_path()))
        .collect();
    assert_eq!(
        got,
        [("", Path::new("/m/d.img")), ("b", Path::new("/m/b.img"))]
    );
    assert_eq!(s.metrics.as_deref(), Some("127.0.0.1:9100"));
    assert_eq!(s.pidfile, Some(PathBuf::from("/tmp/file.pid")));

    let a = Flags {
        fuse: vec!["b=/n/b.img".into()],
        metrics: Some("0.0.0.0:9200".into()),
        pidfile: Some("/tmp/flag.pid".into()),
        ..Default::default()
    };
    let s = Settings::merge(&a, &cfg).unwrap();
    assert_eq!(s.fuse.len(), 1, "--fuse replaces the file's list");
    assert_eq!(s.fuse[0].export, "b");
    assert_eq!(s.fuse[0].file, PathBuf::from("/n/b.img"));
    assert_eq!(s.fuse[0].spec, "b=/n/b.img");
    assert_eq!(s.metrics.as_deref(), Some("0.0.0.0:9200"));
    assert_eq!(s.pidfile, Some(PathBuf::from("/tmp/flag.pid")));

    // A FILE alone needs a default export; the error names where it came from.
    let two = Config::parse(
        "fuse = [\"/m/x.img\"]\n[[export]]\nname=\"a\"\nbackend=\"null:1M\"\n[[export]]\nname=\"b\"\nbackend=\"null:1M\"",
    )
    .unwrap();
    let e = err(Settings::merge(&Flags::default(), &two));
    assert!(
        e.contains("fuse /m/x.img") && e.contains("NAME=FILE"),
        "{e}"
    );
    let a = Flags {
        fuse: vec!["/m/y.img".into()],
        ..Default::default()
    };
    let e = err(Settings::merge(&a, &two));
    assert!(e.contains("--fuse /m/y.img"), "{e}");
    let a = Flags {
        default_export: Some("b".into()),
        ..Default::default()
    };
    assert_eq!(Settings::merge(&a, &two).unwrap().fuse[0].export, "b");
}

#[test]
fn settings_flag_errors_name_the_flag() {
    for (f, want) in [
        (
            Flags {
                coalesce_us: Some(5000),
                ..Default::default()
            },
            "--coalesce-us",
        ),
        (
            Flags {
                poll_us: Some(PollSetting::Fixed(20_000)),
                ..Default::default()
            },
            "--poll-us",
        ),
        (
            Flags {
                exports: vec!["nobackend".into()],
                ..Default::default()
            },
            "--export",
        ),
        (
            Flags {
                max_request: Some("12Q".into()),
                ..Default::default()
            },
            "--max-request",
        ),
        (
            Flags {
                max_request: Some("100".into()),
                ..Default::default()
            },
            "--max-request",
        ),
        (
            Flags {
                exports: vec!["a=memory:1M".into()],
                default_export: Some("zz".into()),
                ..Default::default()
            },
            "--default-export",
        ),
        (
            Flags {
                threads: Some(0),
                ..Default::default()
            },
            "--threads",
        ),
        (
            Flags {
                tcp: Some("h:99999".into()),
                ..Default::default()
            },
            "--tcp",
        ),
        (
            Flags {
                metrics: Some("256.0.0.1:99999".into()),
                ..Default::default()
            },
            "--metrics",
        ),
        (
            Flags {
                backend: Some("nocolon".into()),
                ..Default::default()
            },
            "BACKEND",
        ),
        (
            Flags {
                stages: vec![":x=1".into()],
                ..Default::default()
            },
            "--stage",
        ),
    ] {
        let e = err(Settings::merge(&f, &Config::default()));
        assert!(e.contains(want), "{want}: {e}");
    }
}

#[test]
fn fuse_specs() {
    let names: Vec<String> = vec!["".into(), "a".into()];
    let (n, f) = parse_fuse_spec("/x/d.img", &names, None).unwrap();
    assert_eq!((n, f), ("", PathBuf::from("/x/d.img")));
    let (n, f) = parse_fuse_spec("a=/x/a.img", &names, None).unwrap();
    assert_eq!((n, f), ("a", PathBuf::from("/x/a.img")));
    // Not an export name: the whole spec is the file.
    let (n, f) = parse_fuse_spec("b=/x/a.img", &names, None).unwrap();
    assert_eq!((n, f), ("", PathBuf::from("b=/x/a.img")));
    let (n, _) = parse_fuse_spec("/x/d.img", &names, Some("a")).unwrap();
    assert_eq!(n, "a");
    let two: Vec<String> = vec!["a".into(), "b".into()];
    assert!(parse_fuse_spec("/x/d.img", &two, None).is_err());
    let one: Vec<String> = vec!["a".into()];
    assert_eq!(parse_fuse_spec("/x/d.img", &one, None).unwrap().0, "a");
    assert!(parse_fuse_spec("", &one, None).is_err());
    assert!(parse_fuse_spec("a=", &one, None).is_err());
}

#[test]
fn stage_and_backend_specs_are_checked_strictly() {
    let exp = |backend: &str, stages: &str| {
        format!("[[export]]\nname=\"a\"\nbackend=\"{backend}\"\nstages=[{stages}]")
    };
    for (text, want) in [
        (
            exp("null:1G", "\"delay:ms=1\""),
            "export[0].stages[0]: stage delay: unknown option \"ms\"",
        ),
        (
            exp("null:1G", "\"stats\", \"cache:size=1Q\""),
            "export[0].stages[1]: stage cache: option size",
        ),
        (
            exp("memory:1G,size=1G", ""),
            "export[0].backend: backend memory: unknown option \"size\"",
        ),
        (
            exp("bogus:1G", ""),
            "export[0].backend: unknown backend kind \"bogus\"",
        ),
        (
            exp("file:/nonexistent/dir/d.img,direct=maybe", ""),
            "option direct",
        ),
        (
            "stages = [\"delay:ms=1\"]".to_string(),
            "stages[0]: stage delay: unknown option \"ms\"",
        ),
    ] {
        let e = format!("{:#}", Config::parse(&text).unwrap_err());
        assert!(e.contains(want), "{text}: {e}");
    }
    // Checking opens nothing: a file backend is not created.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.img");
    Config::parse(&exp(
        &format!("file:{},size=1M", f.display()),
        "\"delay:all=1ms\"",
    ))
    .unwrap();
    assert!(!f.exists());
}

/// Every field of a full config file, top level and `[[export]]`, set to
/// values of the wrong type, out of range or malformed: parsing and then
/// merging over no flags gives settings, or an error that names the field
/// (ours say `max_request: ...` or `export[0].backend: ...`; the TOML
/// parser's quote the line, which holds the key). Never a panic.
#[test]
fn every_field_with_a_bad_value_is_named() {
    let top: &[(&str, &str)] = &[
        ("socket", "\"/tmp/x.sock\""),
        ("tcp", "\":10810\""),
        ("read_only", "true"),
        ("max_request", "\"1M\""),
        ("max_inflight", "\"64M\""),
        ("threads", "2"),
        ("poll_us", "\"auto\""),
        ("coalesce_us", "50"),
        ("default_export", "\"b\""),
        ("stages", "[\"stats\"]"),
        ("fuse", "[\"/m/b.img\"]"),
        ("metrics", "\"127.0.0.1:9100\""),
        ("pidfile", "\"/tmp/x.pid\""),
    ];
    let export: &[(&str, &str)] = &[
        ("name", "\"b\""),
        ("backend", "\"null:1G\""),
        ("read_only", "false"),
        ("stages", "[\"delay:all=1ms\"]"),
        ("description", "\"scratch\""),
    ];
    let bad = [
        "-1",
        "0",
        "4294967296",
        "18446744073709551615",
        "18446744073709551616",
        "1e300",
        "nan",
        "true",
        "\"\"",
        "\"x\"",
        "\"-1\"",
        "\"99999999999999999999T\"",
        "\"18446744073709551615k\"",
        "\"1Q\"",
        "\"a=b=c\"",
        "\":\"",
        "\"[::1\"",
        "\"x:99999\"",
        "\"\\u0000\"",
        "[]",
        "[1]",
        "[\"\"]",
        "[\"frob\", \"cache:size=1Q\"]",
        "{}",
    ];
    let text = |t: &[(&str, &str)], e: &[(&str, &str)]| {
        let mut s = String::new();
        for (k, v) in t {
            s += &format!("{k} = {v}\n");
        }
        s += "[[export]]\n";
        for (k, v) in e {
            s += &format!("{k} = {v}\n");
        }
        s
    };
    let parse = |s: &str| Config::parse(s).and_then(|c| Settings::merge(&Flags::default(), &c));
    parse(&text(top, export)).expect("the full config is good");
    let (mut refused, mut taken) = (0, 0);
    for (in_export, fields) in [(false, top), (true, export)] {
        for (i, (key, _)) in fields.iter().enumerate() {
            for v in bad {
                let mut f = fields.to_vec();
                f[i].1 = v;
                let s = if in_export {
                    text(top, &f)
                } else {
                    text(&f, export)
                };
                match parse(&s) {
                    Ok(_) => taken += 1,
                    Err(e) => {
                        let e = format!("{e:#}");
                        assert!(e.contains(key), "{key} = {v}: {e}");
                        refused += 1;
                    }
                }
            }
        }
    }
    assert!(refused > taken, "{refused} refused, {taken} taken");
}
