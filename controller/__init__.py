"""The specctl daemon (`daemon/`), its evaluation (`evaluation/`), `bench/` and the CLI (`cli/`)."""
