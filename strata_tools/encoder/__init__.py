"""The scheduler's encoder fine-tuned for "same reward" (``strata encoder finetune``): pairs, training, card."""
