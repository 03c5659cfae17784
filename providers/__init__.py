"""qbackend's built-in providers. Each module registers its provider through the `qbackend`
entry-point group and the `qbackend_providers` hook, exactly as a third-party plugin does."""
