"""Strata's tools wing: what people and CI run beside the services, never imported by them.

The ``strata`` CLI (``cli``), the benches (``bench``), the diagnostics (``diagnose``), the model zoo
(``zoo``) and how a reward model is made (``rm``), local Kafka and Redis (``infra``), the process
supervisor of ``strata up`` (``stack``), the demo's training loop (``train``), compose checks
(``deploy``) and TLS material for tests and demos (``tlsgen``). They import the runtime library,
``strata``; the library and the services never import them (tests/strata/test_contract.py).
"""
