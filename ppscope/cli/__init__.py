"""The `ppscope` command line: one module per subcommand under `commands/`, and the tuning loop the `tune` and
`demo` commands drive."""
