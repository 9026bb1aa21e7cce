"""The reward-model lifecycle as a library (``strata_tools.rm.strong``, ``.light``, ``.lifecycle``, ``.versions``);
``strata rm`` is its command."""
