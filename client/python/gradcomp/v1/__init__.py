"""Generated protobuf and gRPC stubs of gradcomp.v1 (client/python/generate_protos.sh)."""
