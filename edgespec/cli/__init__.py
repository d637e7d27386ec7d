"""The ``edgespec`` command: ``main`` (the group, ``complete``, ``info``, and the one place that
registers every subcommand), ``options`` (what subcommands share) and one module per subcommand.
A subcommand module imports ``options``, never ``main``."""
