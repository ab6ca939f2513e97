// Package eoshttp serves a stateful eos.Processor's committed state over
// HTTP, key by key, from the instance that holds the key's partition, and
// says so when it does not: an endpoint never answers for a partition it
// does not hold, or is restoring, as if the key had no value.
//
//	mux := http.NewServeMux()
//	mux.Handle("GET /state/{key...}", eoshttp.Handler(p))
//
// GET (or HEAD) /state/{key} answers, for the key as the path gives it
// (decoded: escape a "/" in a key as %2F, and a key "." or ".." as %2E):
//
//   - 200 with its committed value (application/octet-stream) when this
//     instance holds its partition, restored;
//   - 404 when it holds the partition and the key has no value there;
//   - 503 with Retry-After: 1 while the partition restores here, while
//     the processor does not run or waits for its assignment, or before
//     it learnt its input's partitions;
//   - 421 (Misdirected Request) when this instance runs, has its
//     assignment and does not hold the partition (another instance does,
//     or it was just revoked from this one): the body names the
//     partition, as JSON {"partition": 3}, so that a caller or a proxy
//     asks its owner.
//
// Every answer carries the key's partition in the header Eoskit-Partition
// when it is known, and Cache-Control: no-store. The key is looked up as
// the processor's store holds it: a windowed or session aggregation keeps
// its windows under window.AppendKey or AppendSessionKey, so read those
// with StateView.Windows and Sessions (a GET of the plain key answers
// 404). What it does not do yet (issue 46): learn which instance owns
// each partition and forward the request there; serve ranges or
// prefixes. Serve it where the probes are, or behind the application's
// own authentication: it answers every key's value.
package eoshttp

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
)

// PartitionHeader names the key's input partition in every answer that
// knows it.
const PartitionHeader = "Eoskit-Partition"

// Source is what Handler serves: an *eos.Processor, or an *eos.Grouped
// (its aggregating processor's state, the worse of its two Healths).
type Source interface {
	State() *eos.StateView
	Health() eoskit.Health
}

// Handler answers GET and HEAD requests for src's keys, the key being the
// request's path value "key" (route it as "GET /state/{key...}"). It
// panics if src keeps no state (a processor without eos.Changelog), as
// http.Handle does for a bad pattern: a programming error, found when
// the program starts.
func Handler(src Source) http.Handler {
	if src.State() == nil {
		panic("eoshttp: the processor keeps no state (give it eos.Changelog)")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "eoshttp: GET or HEAD", http.StatusMethodNotAllowed)
			return
		}
		key := r.PathValue("key")
		if key == "" {
			http.Error(w, "eoshttp: no key (route the handler as GET /state/{key...})", http.StatusBadRequest)
			return
		}
		view := src.State()
		part, err := view.PartitionOf([]byte(key))
		switch {
		case errors.Is(err, eos.ErrNotHeld):
			unavailable(w, "eoshttp: the processor has not read its input's partitions yet")
			return
		case err != nil:
			http.Error(w, "eoshttp: the key's partition cannot be found (see the processor's configuration)", http.StatusInternalServerError)
			return
		}
		w.Header().Set(PartitionHeader, strconv.Itoa(int(part)))
		value, ok, err := view.Lookup([]byte(key))
		var notHeld *eos.NotHeldError
		switch {
		case errors.As(err, &notHeld) && notHeld.Restoring:
			unavailable(w, "eoshttp: the key's partition is restoring here")
		case errors.As(err, &notHeld):
			// Not held: another instance's, unless this one does not
			// run or waits for its assignment (then it cannot tell).
			if h := src.Health(); !h.Running || !h.Joined {
				unavailable(w, "eoshttp: the processor does not run, or waits for its assignment")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusMisdirectedRequest)
			_ = json.NewEncoder(w).Encode(struct {
				Partition int32 `json:"partition"`
			}{part})
		case err != nil:
			http.Error(w, "eoshttp: the state could not be read", http.StatusInternalServerError)
		case !ok:
			http.Error(w, "eoshttp: no value", http.StatusNotFound)
		default:
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(value)
		}
	})
}

func unavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, msg, http.StatusServiceUnavailable)
}

var (
	_ Source = (*eos.Processor)(nil)
	_ Source = (*eos.Grouped)(nil)
)
