"""The parametric scaling law ``L(N, D) = E + A / N**alpha + B / D**beta`` and where it
puts the optimum for a compute budget.

Training costs ``C = 6 N D`` FLOPs (a forward and backward pass over ``D`` tokens of a
model of ``N`` parameters; Kaplan et al. 2020, Hoffmann et al. 2022). Minimising the
law on that curve has a closed form (Hoffmann et al., appendix D.2):

    N_opt = G (C / 6) ** (beta / (alpha + beta))
    D_opt = (C / 6) ** (alpha / (alpha + beta)) / G,   G = (alpha A / (beta B)) ** (1 / (alpha + beta))

so ``N_opt`` grows as ``C ** a`` and ``D_opt`` as ``C ** b``, ``a + b = 1``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

from t5x_like.errors import UserError

FLOPS_PER_PARAM_TOKEN = 6  # forward (2) and backward (4) multiply-adds per parameter and token


@dataclasses.dataclass(frozen=True)
class Law:
    """``L(N, D) = E + A / N**alpha + B / D**beta`` (loss in nats per token)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str = ""

    def __post_init__(self):
        for name in ("E", "A", "B", "alpha", "beta"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise UserError(f"scaling law {name}={value} is not a finite number.")
        if self.alpha <= 0 or self.beta <= 0:
            raise UserError(f"scaling law exponents alpha={self.alpha}, beta={self.beta}: both "
                            "must be positive (loss falls as parameters and tokens grow).")
        if self.A <= 0 or self.B <= 0:
            raise UserError(f"scaling law A={self.A}, B={self.B}: both must be positive.")

    def loss(self, params: float, tokens: float) -> float:
        return self.E + self.A / params ** self.alpha + self.B / tokens ** self.beta

    @property
    def a(self) -> float:
        """The exponent of ``N_opt ∝ C**a``."""
        return self.beta / (self.alpha + self.beta)

    @property
    def b(self) -> float:
        """The exponent of ``D_opt ∝ C**b``."""
        return self.alpha / (self.alpha + self.beta)

    def optimum(self, flops: float) -> tuple[float, float]:
        """``(N_opt, D_opt)`` minimising the loss at ``flops = 6 N D``."""
        if not flops > 0:
            raise UserError(f"compute budget {flops} FLOPs: give a positive number.")
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        per_pass = flops / FLOPS_PER_PARAM_TOKEN
        return g * per_pass ** self.a, per_pass ** self.b / g

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Published fits, by name (``--law=NAME``).
PRESETS = {
    # Chinchilla, approach 3 (Hoffmann et al. 2022, eq. 10).
    "hoffmann2022": Law(1.69, 406.4, 410.7, 0.34, 0.28, "Hoffmann et al. 2022, approach 3"),
    # The replication from Chinchilla's own data points (Besiroglu et al. 2024, eq. 4), whose
    # optimum agrees with Chinchilla's approaches 1 and 2 (about 20 tokens per parameter).
    "besiroglu2024": Law(1.8172, 482.01, 2085.43, 0.3478, 0.3658,
                         "Besiroglu et al. 2024, Chinchilla scaling: a replication attempt"),
}


@dataclasses.dataclass(frozen=True)
class KaplanLaws:
    """Kaplan et al. 2020's separate laws (eqs. 1.1, 1.2): loss limited by parameters alone,
    ``(N_c / N) ** alpha_N`` (non-embedding parameters, trained to convergence), and by
    data alone, ``(D_c / D) ** alpha_D``; no ``E``, and their tokenizer's nats, so only
    the exponents compare with the parametric law's."""

    N_c: float = 8.8e13
    alpha_N: float = 0.076
    D_c: float = 5.4e13
    alpha_D: float = 0.095

    def loss_of_params(self, params: float) -> float:
        return (self.N_c / params) ** self.alpha_N

    def loss_of_tokens(self, tokens: float) -> float:
        return (self.D_c / tokens) ** self.alpha_D


KAPLAN_2020 = KaplanLaws()


def parse_law(text: str) -> Law:
    """A preset name, ``E,A,B,alpha,beta``, or the ``fit.json`` that ``scaling fit`` wrote
    (its approach-3 law)."""
    text = text.strip()
    if text in PRESETS:
        return PRESETS[text]
    if text.endswith(".json"):
        path = pathlib.Path(text)
        if not path.is_file():
            raise UserError(f"--law={text}: no such file; give a fit.json from `scaling fit`, "
                            f"E,A,B,alpha,beta, or one of {sorted(PRESETS)}.")
        fitted = json.loads(path.read_text()).get("approach3", {}).get("law")
        if not fitted:
            raise UserError(f"--law={text}: the file has no approach-3 law (approach3.law); "
                            "write it with `scaling fit`.")
        return Law(**{k: fitted[k] for k in ("E", "A", "B", "alpha", "beta")}, source=text)
    parts = text.split(",")
    if len(parts) != 5:
        raise UserError(f"--law={text!r}: give five numbers E,A,B,alpha,beta, a fit.json, or "
                        f"one of {sorted(PRESETS)}.")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise UserError(f"--law={text!r}: E,A,B,alpha,beta must be numbers.") from None
    return Law(*values, source="--law")
