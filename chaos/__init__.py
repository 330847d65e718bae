"""The chaos campaign: a fault campaign against a real deployment, and the invariant checker of its recorded runs."""
