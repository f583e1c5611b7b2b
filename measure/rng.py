"""The noise's generators: the secure default, the replayable PCG64 streams, and which may be published.

Randomness is always an explicit ``rng``; a release's generator is made here and described in its
manifest (never its key).
"""

from __future__ import annotations

import secrets

import numpy as np
from randomgen import ChaCha

from gedp.errors import InputError

RNG_KINDS = ("secure", "pcg64")
SECURE_DESCRIPTION = {"kind": "secure", "bit_generator": "ChaCha20 (randomgen), 256-bit key from the OS (secrets)"}


def secure_generator() -> np.random.Generator:
    """A cryptographically secure generator: ChaCha20 with a 256-bit key drawn from the OS.

    The key is set directly (``key=``), not through a SeedSequence, whose 128-bit pool would cap
    its entropy at 128 bits.
    """
    return np.random.Generator(ChaCha(key=secrets.randbits(256), rounds=20))


def is_publishable(rng_description: dict) -> bool:
    """Only noise from the secure generator may be published: a seeded or PCG64 stream can be
    replayed or predicted, and replaying it subtracts the noise."""
    return rng_description.get("kind") == "secure"


def check_publication(seed: int | None, rng: str | None, not_for_publication: bool) -> None:
    """Refuse replayable noise (a seed, or PCG64) unless the release is marked not for publication."""
    if (seed is not None or rng == "pcg64") and not not_for_publication:
        raise InputError("a seeded or pcg64 release can be replayed: whoever learns or guesses the seed subtracts "
                         "the noise; add --not-for-publication for a test release, or drop --seed/--rng")


def make_rng(seed: int | None, kind: str | None = None) -> tuple[np.random.Generator, dict]:
    """The release's generator and how the manifest describes it.

    Without a seed, releases use the secure generator (the key is never recorded); a seed gives the
    reproducible PCG64 stream meant for experiments and for releases marked not for publication.
    """
    kind = kind or ("pcg64" if seed is not None else "secure")
    if kind not in RNG_KINDS:
        raise InputError(f"--rng '{kind}' is unknown; choose one of {', '.join(RNG_KINDS)}")
    if seed is not None and seed < 0:
        raise InputError(f"seed ({seed}) must be >= 0")
    if kind == "secure":
        if seed is not None:
            raise InputError("--rng secure draws its key from the operating system and takes no --seed")
        return secure_generator(), dict(SECURE_DESCRIPTION)
    if seed is None:
        return np.random.default_rng(np.random.SeedSequence()), {"kind": "os-entropy", "bit_generator": "PCG64"}
    return np.random.default_rng(seed), {"kind": "seed", "seed": seed, "bit_generator": "PCG64"}


def state_rng(entropy: int, state: str) -> np.random.Generator:
    """The generator of one state's noise: derived from the run's entropy and the exact state code
    (its ASCII bytes, so two different codes never share a stream)."""
    return np.random.default_rng(np.random.SeedSequence([entropy, *state.encode("ascii")]))
