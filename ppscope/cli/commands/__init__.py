"""One module per `ppscope` subcommand; each exposes `register(subparsers)`."""
