"""Shim for venvs set up before the package layout moved (CHANGELOG, "Unreleased"): their
``ortft-cuda11.pth`` runs ``import ortft.cudalibs; ortft.cudalibs.install_hook()``. A new
``make setup GPU=1`` writes ``ortft.env.cudalibs`` instead; this module only forwards."""

from ortft.env.cudalibs import install_hook, main

__all__ = ["install_hook", "main"]
