"""Entry point for `python -m sim`."""

from .cli import main

raise SystemExit(main())
