"""The offline model zoo: the prompt suite, its oracle, and the tiny models built from code (docs/model-zoo.md)."""
