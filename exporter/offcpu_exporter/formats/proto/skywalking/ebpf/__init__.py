"""Generated SkyWalking protocol modules (see generate.py)."""
