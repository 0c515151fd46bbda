"""`python -m runtime` (under torchrun): see runtime/cli.py."""

import sys

from .cli import main

sys.exit(main())
