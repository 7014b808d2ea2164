"""An attention-score variant: scores soft-capped by cap * tanh(s / cap) (Gemma 2's logit
softcap) before the softmax, written as plain PyTorch:

    speedlight shape examples/shape/softcap_attention.py:softcap_attention \\
        --shapes "q=[1,16,2000,72]:bf16,k=[1,16,2000,72]:bf16,v=[1,16,2000,72]:bf16"
"""

import torch


def softcap_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cap: float = 50.0):
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    scores = cap * torch.tanh(scores / cap)
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
