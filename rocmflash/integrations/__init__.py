"""Framework integrations (imported on demand): :mod:`rocmflash.integrations.hf` for transformers."""
