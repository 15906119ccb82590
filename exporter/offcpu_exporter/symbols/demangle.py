"""C++ (Itanium ABI) and Rust symbol demangling."""

from __future__ import annotations

import re
from functools import lru_cache

import cxxfilt
import rust_demangler

__all__ = ["demangle"]

# Rust's legacy mangling is Itanium-shaped with a trailing hash element: _ZN...17h<16 hex>E.
_RUST_LEGACY = re.compile(r"17h[0-9a-f]{16}E(?:\.|$)")
_RUST_HASH_SUFFIX = re.compile(r"::h[0-9a-f]{16}$")


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """The readable form of ``name``; the name itself when it is not mangled or not valid."""
    try:
        if name.startswith("_R") or (name.startswith("_ZN") and _RUST_LEGACY.search(name)):
            # Like rustc-demangle's alternate format: no trailing hash.
            return _RUST_HASH_SUFFIX.sub("", rust_demangler.demangle(name))
        if name.startswith("_Z"):
            return cxxfilt.demangle(name)
    except Exception:  # invalid manglings raise library-specific errors
        return name
    return name
