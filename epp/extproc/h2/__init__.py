"""EPP's own HTTP/2 transport for the ext_proc gRPC method: framing and flow control, HPACK, the gRPC server on top."""
