// Package protocodec is gRPC's protobuf codec with buffers that are not
// cleared: the codec of ledgerd's server and of ledgerclient's connections.
//
// gRPC's own codec takes the buffer of a message of 1 KiB or more from
// mem.DefaultBufferPool, which clears a buffer before it lends it, and
// whose tiers jump from 32 KiB to 1 MiB: a 256 KiB outcome costs the
// clearing of 1 MiB when the client encodes it and again when the server
// joins its frames to decode it. This codec writes every byte of a buffer
// before it reads any, so it takes its buffers from bufpool.Pool, which
// neither clears them nor lends more than twice what was asked.
package protocodec

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/idemledger/idemledger/internal/bufpool"
)

// Codec returns the codec, named "proto" as gRPC's is. Install it on a
// server with grpc.ForceServerCodecV2 and on a connection with
// grpc.WithDefaultCallOptions(grpc.ForceCodecV2(...)).
func Codec() encoding.CodecV2 { return codec{} }

type codec struct{}

func (codec) Name() string { return "proto" }

// Marshal encodes v into one buffer of bufpool.Pool (a small message into a
// buffer of its own, as gRPC's codec does).
func (codec) Marshal(v any) (mem.BufferSlice, error) {
	msg, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("protocodec: marshal %T: not a proto.Message", v)
	}
	size := proto.Size(msg)
	// UseCachedSize reuses the sizes proto.Size just computed: the message
	// is not changed in between.
	opts := proto.MarshalOptions{UseCachedSize: true}
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(msg)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := bufpool.Pool.Get(size)
	b, err := opts.MarshalAppend((*buf)[:0], msg)
	if err != nil {
		bufpool.Pool.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, bufpool.Pool)}, nil
}

// Unmarshal decodes data into v: in place when it is one buffer, else
// joined into a buffer of bufpool.Pool. Protobuf copies what it keeps, so the
// buffer goes back to the pool at once.
func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	msg, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("protocodec: unmarshal %T: not a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(bufpool.Pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), msg)
}
