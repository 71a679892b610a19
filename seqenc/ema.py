"""MEGA's damped exponential moving average, and MAFiD's low-dimensional form of it.

**Damped EMA** (Ma et al., 2022, "Mega", section 2-3; MAFiD's Appendix E refers to it). Each of
the D channels of x [B, L, D] is expanded to ``ema_dim`` (MEGA's h) hidden channels by beta,
each of which runs its own damped recurrence, and eta projects them back:

    u_t = beta * x_t                                     (per channel, [D, h])
    s_t = alpha * u_t + (1 - alpha * delta) * s_{t-1}     alpha, delta in (0, 1) (sigmoids)
    y_t = sum_h eta * s_t

Unrolled, y = K * x, a causal convolution with the kernel
K[j] = sum_h eta alpha beta (1 - alpha delta)^j, so the layer costs O(L log L) by FFT (O(L)
memory) and never builds an L x L matrix. :meth:`DampedEMA.recurrent` is the same thing as the
loop above, for reference (tests compare them).

Choices where the papers are vague or leave options: ``bidirectional`` (default True, MEGA's
encoder form): a second set of parameters runs the recurrence right to left and the two
outputs are summed, so every position sees both sides (an encoder reads the whole table);
MEGA's extra skip omega * x is left to the surrounding residual block; init as MEGA's: the
logits of alpha and delta ~ N(0, 0.2), beta ~ N(0, 0.02) + (+1, -1, +1, ...) over h, eta ~
N(0, 1) / sqrt(h). Padding positions
(``mask`` False) are zeroed on the way in and the way out, so they never leak into real ones.

**Low-dimensional EMA** (MAFiD, Eq. 3-4): Linear (D -> D / K), the damped EMA, Linear (D / K ->
D): the cross-position mixing runs in a K-times smaller space.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class DampedEMA(nn.Module):
    """x [B, L, D] (mask [B, L] bool, True = real) -> y [B, L, D]; module docstring."""

    def __init__(self, dim: int, ema_dim: int = 2, bidirectional: bool = True):
        super().__init__()
        self.dim, self.ema_dim, self.bidirectional = dim, ema_dim, bidirectional
        channels = dim * (2 if bidirectional else 1)  # forward channels, then backward ones
        self.alpha = nn.Parameter(torch.randn(channels, ema_dim) * 0.2)  # logits
        self.delta = nn.Parameter(torch.randn(channels, ema_dim) * 0.2)  # logits
        signs = torch.ones(ema_dim)
        signs[1::2] = -1
        self.beta = nn.Parameter(torch.randn(channels, ema_dim) * 0.02 + signs)
        self.eta = nn.Parameter(torch.randn(channels, ema_dim) / math.sqrt(ema_dim))

    def _coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(input weight alpha * beta * eta, decay 1 - alpha * delta), each [channels, h]."""
        alpha, delta = torch.sigmoid(self.alpha), torch.sigmoid(self.delta)
        return alpha * self.beta * self.eta, 1.0 - alpha * delta

    def kernel(self, length: int) -> torch.Tensor:
        """[channels, length]: K[c, j] = sum_h w_ch decay_ch^j."""
        weight, decay = self._coefficients()
        steps = torch.arange(length, device=weight.device, dtype=weight.dtype)
        powers = torch.exp(steps * torch.log(decay)[..., None])  # [channels, h, length]
        return (weight[..., None] * powers).sum(1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, L, D = x.shape
        if mask is not None:
            x = x * mask[..., None].to(x.dtype)
        k = self.kernel(L)  # [channels, L]
        y = _causal_conv(x, k[:D])
        if self.bidirectional:
            y = y + _causal_conv(x.flip(1), k[D:]).flip(1)
        return y if mask is None else y * mask[..., None].to(y.dtype)

    @torch.no_grad()
    def recurrent(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The recurrence itself, one step at a time (the reference for tests): [B, L, D]."""
        B, L, D = x.shape
        if mask is not None:
            x = x * mask[..., None].to(x.dtype)
        alpha, delta = torch.sigmoid(self.alpha), torch.sigmoid(self.delta)

        def run(xs: torch.Tensor, c: slice) -> torch.Tensor:
            state = xs.new_zeros(B, D, self.ema_dim)  # s_0 = 0
            out = []
            for t in range(L):
                u = self.beta[c] * xs[:, t, :, None]  # [B, D, h]
                state = alpha[c] * u + (1.0 - alpha[c] * delta[c]) * state
                out.append((self.eta[c] * state).sum(-1))
            return torch.stack(out, 1)

        y = run(x, slice(0, D))
        if self.bidirectional:
            y = y + run(x.flip(1), slice(D, 2 * D)).flip(1)
        return y if mask is None else y * mask[..., None].to(y.dtype)


def _causal_conv(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """y[b, t, c] = sum_{j <= t} k[c, j] x[b, t - j, c] by FFT: x [B, L, C], k [C, L]."""
    L = x.size(1)
    n = 2 * L  # zero-padded: no circular wrap-around
    xf = torch.fft.rfft(x.float(), n=n, dim=1)  # [B, n/2 + 1, C]
    kf = torch.fft.rfft(k.float(), n=n, dim=1).transpose(0, 1)  # [n/2 + 1, C]
    return torch.fft.irfft(xf * kf, n=n, dim=1)[:, :L].to(x.dtype)


class LowDimEMA(nn.Module):
    """MAFiD's low-dimensional EMA (Eq. 3-4): reduce D -> D / K, damped EMA, reconstruct.
    ``reduction=1`` keeps the full dimension (the paper's ablation "full-dimensional EMA")."""

    def __init__(self, d_model: int, reduction: int = 4, ema_dim: int = 2, bidirectional: bool = True):
        super().__init__()
        if reduction < 1 or d_model % reduction:
            raise ValueError(f"reduction={reduction} must divide d_model={d_model}")
        low = d_model // reduction
        self.reduce = nn.Linear(d_model, low) if reduction > 1 else nn.Identity()
        self.ema = DampedEMA(low, ema_dim, bidirectional)
        self.reconstruct = nn.Linear(low, d_model) if reduction > 1 else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, L, d_model] -> [B, L, d_model]
        return self.reconstruct(self.ema(self.reduce(x), mask))
