"""The specctl daemon (scrape -> store -> model -> table -> push) and the `specctl` CLI."""
