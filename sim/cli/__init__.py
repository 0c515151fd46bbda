"""The command-line wing of sim/: one module per subcommand of `python -m sim` (sim/__main__.py).

Each module registers its parser (`add_parser`), reads the parsed arguments into a
frozen dataclass of typed options at the edge, and calls library functions of the model
(sim/*.py) and plot (sim/plot/) wings; the argparse Namespace goes no further. The
modules share only `args` (argument types, the cost flags, the one-line error); none
imports another.
"""
