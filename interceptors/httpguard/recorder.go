package httpguard

import (
	"bytes"
	"net/http"
)

// recorder buffers a handler's response, so that it can be stored before
// it is sent. A protected route's response is sent once the handler
// returns: it does not stream. Past limit bytes of body the rest is
// dropped, and overflow says so.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
	limit       int64
	overflow    bool
}

func newRecorder(limit int64) *recorder {
	return &recorder{header: http.Header{}, status: http.StatusOK, limit: limit}
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.wroteHeader || status < 200 { // informational answers are not kept
		return
	}
	r.status, r.wroteHeader = status, true
}

// Write buffers b, or drops it past the limit; it never fails, so that a
// handler (a reverse proxy's copy) ends as it would, not with a panic.
func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.overflow || int64(r.body.Len()+len(b)) > r.limit {
		r.overflow = true
		r.body.Reset()
		return len(b), nil
	}
	return r.body.Write(b)
}

// response is what the handler answered.
func (r *recorder) response() *Response {
	return &Response{Status: r.status, Header: r.header, Body: r.body.Bytes()}
}

// writeTo sends the recorded response, every header of it.
func (r *recorder) writeTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}
