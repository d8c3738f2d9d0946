fn main() -> std::process::ExitCode {
    iolift::cli::main()
}
