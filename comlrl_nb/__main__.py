"""`python -m comlrl_nb ...`: the `comlrl-nb` command, as launchers run it (`torchrun ... -m comlrl_nb train ...`).

A plain module, not exported from a notebook (see 80_cli: in a notebook `__name__` is "__main__" too)."""
from .cli import main

if __name__ == "__main__": raise SystemExit(main())
