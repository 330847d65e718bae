"""Acme's pipelines for Reliability Console. List ``acme_pipelines.orders`` in ``RELIABILITY_PIPELINE_MODULES``."""
