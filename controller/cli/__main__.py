"""`python -m controller.cli`: the `specctl` console script without installing it."""

from controller.cli import main

main()
