"""The Cairn wire contract: subjects, job bodies, messages, protojson and the generated protobufs."""
