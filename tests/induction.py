"""A 2-layer GPT-2 whose weights are set by hand to copy (an induction circuit).

The residual stream has four blocks of coordinates: the token (one-hot), the position
(one-hot), the previous token (written by layer 1) and the output (written by layer 2).
Layer 1's head attends from ``i`` to ``i − 1`` (positions) and copies that token into the
previous-token block; layer 2's head attends from ``i`` to every ``j`` whose previous token
is token ``i`` and copies token ``j`` into the output block, which the unembedding reads.
The feed-forward layers are zero, the norms plain (γ = 1, β = 0).
"""

from __future__ import annotations

import torch
from torch import nn


def induction_gpt2(vocab: int = 16, positions: int = 32, sharpness: float = 30.0) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    token, position, previous, output = 0, vocab, vocab + positions, 2 * vocab + positions
    d = 3 * vocab + positions
    config = GPT2Config(vocab_size=vocab, n_embd=d, n_layer=2, n_head=1, n_positions=positions,
                        n_inner=4, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = GPT2LMHeadModel(config).eval()
    scale = sharpness * d ** 0.5  # undo the 1/√d of the scores
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
        wte = model.transformer.wte.weight
        wpe = model.transformer.wpe.weight
        for t in range(vocab):
            wte[t, token + t] = 1.0
        for p in range(positions):
            wpe[p, position + p] = 1.0
        first, second = model.transformer.h
        # c_attn is a Conv1D: weight (d, 3d) = [W_Q | W_K | W_V]
        w = first.attn.c_attn.weight
        for p in range(positions - 1):
            w[position + p + 1, p] = scale          # query of position i: coordinate i − 1 …
            w[position + p, d + p] = 1.0             # … key of position j: coordinate j
        for t in range(vocab):
            w[token + t, 2 * d + previous + t] = 1.0  # value: the token, into the previous block
            first.attn.c_proj.weight[previous + t, previous + t] = 1.0
        w = second.attn.c_attn.weight
        for t in range(vocab):
            w[token + t, t] = scale                  # query: the current token
            w[previous + t, d + t] = 1.0             # key: the previous token
            w[token + t, 2 * d + output + t] = 1.0   # value: the token, into the output block
            second.attn.c_proj.weight[output + t, output + t] = 1.0
            model.lm_head.weight[t, output + t] = 10.0
    return model
