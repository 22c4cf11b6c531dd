"""The embedded stack: Redis, NATS, S3 and the fleet's processes run as a deployment runs them."""
