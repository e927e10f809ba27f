"""Applications on top of the engine: the ``accel`` command line's subcommands and the demo.

One module per subcommand (``compress``, ``export``, ``generate`` with ``generate_flags``, ``predict`` with
``predict_ppd``, ``drafts`` with ``hydra``, ``superposed``), the text output of a decode (``printing``), PPD's
command path (``ppd``) and ``demo`` (``accel demo``). ``accel.cli`` is the entry point that registers them.

The engine packages (``formats``, ``models``, ``backends``, ``sim``, ``spd``, ``drafts``, ``superposed``,
``serving``) and the recipe layer (``decode``) never import this package, and never import upward among themselves:
``tests/test_layers.py`` enforces the order.
"""

__all__: list[str] = []
