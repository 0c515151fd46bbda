"""`python -m runtime` (under torchrun): see runtime/cli.py; `python -m runtime launch ...`
starts the ranks itself (torchrun from Python): see runtime/launch.py."""

import sys

if sys.argv[1:2] == ["launch"]:
    from .launch import main as launch

    sys.exit(launch(sys.argv[2:]))

from .cli import main

sys.exit(main())
