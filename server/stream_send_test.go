package server

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
)

// gatedStream is a Stream's server side whose Send waits at a gate: the
// messages it was given, and a signal as each Send begins.
type gatedStream struct {
	grpc.ServerStream
	gate    chan struct{}
	entered chan struct{}
	sent    []*ledgerv1.StreamResponse
}

func (g *gatedStream) Send(res *ledgerv1.StreamResponse) error {
	g.entered <- struct{}{}
	<-g.gate
	g.sent = append(g.sent, res)
	return nil
}

func (*gatedStream) Recv() (*ledgerv1.StreamRequest, error) { panic("not read") }

// answerOf is call id's answer: a Begin's replay whose outcome holds size
// bytes.
func answerOf(id uint64, size int) *ledgerv1.StreamResponse {
	return &ledgerv1.StreamResponse{Id: id, Result: &ledgerv1.StreamResponse_Begin{Begin: &ledgerv1.BeginResponse{
		Result: &ledgerv1.BeginResponse_Replay{Replay: &ledgerv1.Replay{Outcome: &ledgerv1.Outcome{
			Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: bytes.Repeat([]byte{7}, size)}}}}}}}}
}

// TestAnswersWrittenTogether: answers that are ready while the one before
// is being written go together in the next message, up to maxBatch bytes
// of them; an answer larger than that goes alone; none is lost or sent
// twice, and the caller that found the stream idle writes them all.
func TestAnswersWrittenTogether(t *testing.T) {
	t.Parallel()
	g := &gatedStream{gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	st := &callStream{stream: g}
	first := answerOf(1, 10)
	done := make(chan struct{})
	go func() {
		st.send(first)
		close(done)
	}()
	select {
	case <-g.entered:
	case <-time.After(time.Minute):
		t.Fatal("the first answer was not written")
	}
	// While it is written: two small answers, three of 30 KiB, one over
	// maxBatch alone, one small. Each send returns at once, its answer
	// queued for the writer.
	queued := make(chan struct{})
	go func() {
		for _, a := range []*ledgerv1.StreamResponse{answerOf(2, 10), answerOf(3, 10), answerOf(4, 30<<10), answerOf(5, 30<<10), answerOf(6, 30<<10), answerOf(7, maxBatch+1), answerOf(8, 10)} {
			st.send(a)
		}
		close(queued)
	}()
	select {
	case <-queued:
	case <-time.After(10 * time.Second):
		t.Fatal("an answer's send waited for the write before it")
	}
	close(g.gate)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the writer did not return")
	}
	var got [][]uint64
	for _, m := range g.sent {
		var ids []uint64
		size := 0
		first := proto.CloneOf(m)
		first.More = nil
		for _, a := range append([]*ledgerv1.StreamResponse{first}, m.GetMore()...) {
			if len(a.GetMore()) != 0 {
				t.Errorf("answer %d carries more answers of its own", a.GetId())
			}
			ids = append(ids, a.GetId())
			size += proto.Size(a)
		}
		if len(ids) > 1 && size > maxBatch {
			t.Errorf("a message of %d answers holds %d bytes, over %d", len(ids), size, maxBatch)
		}
		got = append(got, ids)
	}
	// 2, 3, 4 and 5 fit in 64 KiB (two 30 KiB outcomes and two small);
	// 6 would pass it; 7 is over it alone; 8 follows it.
	want := [][]uint64{{1}, {2, 3, 4, 5}, {6}, {7}, {8}}
	if len(got) != len(want) {
		t.Fatalf("messages %v, want %v", got, want)
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("messages %v, want %v", got, want)
		}
	}
	if len(st.queued) != 0 || st.writing {
		t.Fatalf("after the writer returned: %d answers queued, writing %v", len(st.queued), st.writing)
	}
	// Idle again: the next answer is written by its own caller, alone.
	g.gate = make(chan struct{})
	close(g.gate)
	st.send(answerOf(9, 10))
	<-g.entered
	if last := g.sent[len(g.sent)-1]; len(last.GetMore()) != 0 || last.GetId() != 9 {
		t.Fatalf("the answer sent on an idle stream went as %v", last)
	}
}
