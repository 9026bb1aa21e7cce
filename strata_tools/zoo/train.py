"""Training loops of the zoo's language models: a BPE tokenizer and GPT-2-shaped causal LMs.

Short and CPU-friendly on purpose (nanoGPT-style: random blocks of a packed token stream, AdamW,
linear warm-up then cosine decay, ``strata.models.training``). Each function trains in place and
returns the final loss; the build (``strata_tools.zoo.build``) decides sizes and steps and saves the results.
Reward models train in ``strata_tools.rm.train``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

from strata.models.training import ModelShape, TrainConfig, gpt2_config, make_optimizer, optimizer_step

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on ``texts``, wrapped as a Hugging Face fast tokenizer."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=PAD_TOKEN, unk_token=None
    )


def new_causal_lm(
    tokenizer: PreTrainedTokenizerFast, shape: ModelShape, n_positions: int, seed: int
) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(gpt2_config(tokenizer, shape, n_positions))


def pack_texts(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str]) -> torch.Tensor:
    """All texts as one token stream, each followed by EOS: (N_tokens,)."""
    ids: list[int] = []
    for encoded in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def train_causal_lm(model: GPT2LMHeadModel, stream: torch.Tensor, block_size: int, cfg: TrainConfig, seed: int,
                    desc: str) -> float:
    """Next-token training on random ``block_size`` windows of the packed ``stream``."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = make_optimizer(model, cfg)
    model.train()
    loss_ema = float("nan")
    bar = tqdm(range(cfg.steps), desc=desc, unit="step", leave=False)
    for step in bar:
        starts = torch.randint(0, len(stream) - block_size - 1, (cfg.batch_size,), generator=generator)
        x = torch.stack([stream[s : s + block_size] for s in starts.tolist()])  # (B, T)
        loss = model(input_ids=x, labels=x).loss  # HF shifts the labels by one inside
        loss_ema = optimizer_step(model, optimizer, loss, cfg, step, loss_ema)
        bar.set_postfix(loss=f"{loss_ema:.3f}", refresh=False)  # drawn at the bar's own pace
    model.eval()
    logger.info("%s: %d steps, final loss %.3f", desc, cfg.steps, loss_ema)
    return loss_ema


