"""The reward-model lifecycle as a library (``strata_tools.rm.lifecycle``); ``strata rm`` is its command."""
