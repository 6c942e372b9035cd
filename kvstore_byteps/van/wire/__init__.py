"""ps-lite's wire: messages, node ids and key ranges, the meta codec and its protobuf schema. Pure."""
