"""Tests of the Celery app, its hardening and the deployment as a whole."""
