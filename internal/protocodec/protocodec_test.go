package protocodec_test

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // gRPC's codec, to compare with
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/internal/protocodec"
)

func message(fill byte, size int) *anypb.Any {
	return &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: bytes.Repeat([]byte{fill}, size)}
}

// frames cuts data into buffers of at most n bytes, as gRPC's transport
// hands a message over in its HTTP/2 frames.
func frames(data []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(data) > 0 {
		k := min(n, len(data))
		s = append(s, mem.SliceBuffer(bytes.Clone(data[:k])))
		data = data[k:]
	}
	return s
}

// TestRoundTrip: what Marshal writes is protobuf's encoding of the
// message, and Unmarshal reads it back whole, in one buffer or in frames.
// Larger messages come first, so the smaller ones get the pool's used,
// uncleared buffers: nothing of the earlier bytes shows.
func TestRoundTrip(t *testing.T) {
	c := protocodec.Codec()
	if c.Name() != "proto" {
		t.Fatalf("Name = %q, want proto (gRPC's content subtype)", c.Name())
	}
	for _, size := range []int{300 << 10, 200 << 10, 129 << 10, 2 << 10, 900, 10, 0} {
		want := message(byte('a'+size%26), size)
		data, err := c.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		encoded := data.Materialize()
		if plain, _ := proto.Marshal(want); !bytes.Equal(encoded, plain) {
			t.Fatalf("%d bytes: Marshal wrote %d bytes that are not protobuf's %d", size, len(encoded), len(plain))
		}
		data.Free()
		for _, in := range []mem.BufferSlice{{mem.SliceBuffer(encoded)}, frames(encoded, 16<<10)} {
			got := new(anypb.Any)
			if err := c.Unmarshal(in, got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("%d bytes in %d buffers: decoded another message", size, len(in))
			}
		}
	}
}

// TestNotAMessage: a value that is not a protobuf message is an error,
// both ways.
func TestNotAMessage(t *testing.T) {
	c := protocodec.Codec()
	if _, err := c.Marshal("x"); err == nil {
		t.Error("Marshal of a string: no error")
	}
	var s string
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer("x")}, &s); err == nil {
		t.Error("Unmarshal into a string: no error")
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer{0xff}}, new(anypb.Any)); err == nil {
		t.Error("Unmarshal of bytes that are not protobuf: no error")
	}
}

// BenchmarkMarshalUnmarshal: a message that carries a 256 KiB outcome,
// encoded, and decoded from 16 KiB frames, by gRPC's codec and by this one.
func BenchmarkMarshalUnmarshal(b *testing.B) {
	msg := message('x', 256<<10)
	plain, err := proto.Marshal(msg)
	if err != nil {
		b.Fatal(err)
	}
	in := frames(plain, 16<<10)
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"grpc", encoding.GetCodecV2("proto")}, {"protocodec", protocodec.Codec()}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(plain)))
			for b.Loop() {
				data, err := c.codec.Marshal(msg)
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
				if err := c.codec.Unmarshal(in, new(anypb.Any)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
