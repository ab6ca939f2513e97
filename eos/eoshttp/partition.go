package eoshttp

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/eoskit/eoskit/eos"
)

// RenderFunc turns one input partition of a processor's committed state
// into the value Partition answers as JSON: it reads the partition with
// view.ScanPartition (or Get, or Windows), and returns what that read
// returned when it fails, a *eos.NotHeldError among them.
type RenderFunc func(view *eos.StateView, partition int32) (any, error)

// Partition answers GET and HEAD requests for one input partition of
// src's state, the partition being the request's path value "partition"
// (route it as "GET /totals/{partition}"), with what render makes of it,
// as JSON: a whole partition's totals, say, which a page adds up over the
// partitions ([eos.StateView.InputPartitions] says how many; 0 to n-1).
// It answers as Handler does for a key:
//
//   - 200 with render's value, as JSON, when this instance holds the
//     partition, restored (render returned no error);
//   - 503 with Retry-After: 1 while it restores here, while the processor
//     does not run or waits for its assignment, or before it learnt its
//     input's partitions;
//   - 421 (or, with [Forward], the owner's answer, relayed) when another
//     instance holds it;
//   - 400 for a partition that is no number, 404 for one the input does
//     not have, 500 when render fails otherwise (the error is not shown:
//     log it in render).
//
// Every answer carries the partition in the header Eoskit-Partition and
// Cache-Control: no-store. Partitions spread keys by their hash, so a
// page that adds them up must have every partition's 200 before it shows
// a sum: one missing is a partial sum, not a smaller one. It panics if
// src keeps no state, as Handler does.
func Partition(src Source, render RenderFunc, opts ...Option) http.Handler {
	if src.State() == nil {
		panic("eoshttp: the processor keeps no state (give it eos.Changelog)")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "eoshttp: GET or HEAD", http.StatusMethodNotAllowed)
			return
		}
		p, err := strconv.ParseInt(r.PathValue("partition"), 10, 32)
		if err != nil || p < 0 {
			http.Error(w, "eoshttp: the partition is no number (route the handler as GET /path/{partition})", http.StatusBadRequest)
			return
		}
		part := int32(p)
		w.Header().Set(PartitionHeader, strconv.Itoa(int(part)))
		view := src.State()
		n, err := view.InputPartitions()
		switch {
		case err != nil:
			unavailable(w, "eoshttp: the processor has not read its input's partitions yet")
			return
		case part >= n:
			http.Error(w, "eoshttp: the input has no such partition", http.StatusNotFound)
			return
		}
		value, err := render(view, part)
		var notHeld *eos.NotHeldError
		switch {
		case errors.As(err, &notHeld) && notHeld.Partition == part:
			o.notHeld(w, r, src, notHeld)
		case err != nil:
			http.Error(w, "eoshttp: the partition could not be read", http.StatusInternalServerError)
		default:
			body, err := json.Marshal(value)
			if err != nil {
				http.Error(w, "eoshttp: the partition's value is no JSON", http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(append(body, '\n'))
		}
	})
}
