"""The offline model zoo: the tiny models built from code on the synthetic task (docs/model-zoo.md)."""
