"""The reward-model lifecycle as a library (``strata.rm.lifecycle``); ``strata rm`` is its command."""
