"""The Cairn bridge package (``python -m bridges cairn``): one module per concept.

* ``bridge`` — the process: connections, wiring, start and stop;
* ``holder`` — the decision core: one held message from arrival to disposition;
* ``record`` — the bridge's liveness record for ``switchyard health``;
* ``pull`` — the pull loops, one per durable consumer, within the in-flight limit;
* ``admission`` — the one decision point: dispatch, adopt, or settle now (:func:`admission.admit`);
* ``execution`` — a dispatched job's task and lease until its outcome; adopting a dead bridge's task;
* ``settle`` — applying a disposition (ack / nak with delay / term) and counting failed deliveries;
* ``consumers`` — the pool's durable JetStream consumers;
* ``results`` — Celery task results over one Redis pub/sub connection;
* ``responders`` — discover and OAuth exchange request/reply;
* ``envelopes`` — the failure envelopes the bridge publishes before its own terms.

Nothing here imports ``tasks``: the task senders and the result backend are
injected by ``bridges.__main__``.
"""
