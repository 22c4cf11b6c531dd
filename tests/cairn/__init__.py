"""Tests of the Cairn side: bridge, contract, handlers, webhooks."""
