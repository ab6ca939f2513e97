// Package eoshttp serves a stateful eos.Processor's committed state over
// HTTP, key by key, from the instance that holds the key's partition, and
// says so when it does not: an endpoint never answers a partial or stale
// state as if it were the whole.
//
//	mux := http.NewServeMux()
//	mux.Handle("GET /state/{key...}", eoshttp.Handler(p))
//
// GET /state/{key} answers, for the key as the path gives it (decoded):
//
//   - 200 with its committed value (application/octet-stream) when this
//     instance holds its partition, restored;
//   - 404 when it holds the partition and the key has no value;
//   - 503 with Retry-After: 1 while the partition restores here (or the
//     processor has not learnt its input's partitions yet);
//   - 421 (Misdirected Request) when another instance holds the
//     partition: the body names the partition, as JSON
//     {"partition": 3}, so that a caller or a proxy asks its owner.
//
// Every answer carries the key's partition in the header
// Eoskit-Partition when it is known. What it does not do yet (issue 46):
// learn which instance owns each partition and forward the request there;
// serve ranges or prefixes. Serve it where the probes are, or behind the
// application's own authentication: it answers every key's value.
package eoshttp

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"

	"github.com/eoskit/eoskit/eos"
)

// PartitionHeader names the key's input partition in every answer that
// knows it.
const PartitionHeader = "Eoskit-Partition"

// Handler answers GET requests for p's keys, the key being the request's
// path value "key" (route it as "GET /state/{key...}"); p must have been
// given eos.Changelog.
func Handler(p *eos.Processor) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		view := p.State()
		key := r.PathValue("key")
		switch {
		case view == nil:
			http.Error(w, "eoshttp: the processor keeps no state", http.StatusInternalServerError)
			return
		case key == "":
			http.Error(w, "eoshttp: no key", http.StatusBadRequest)
			return
		}
		part, err := view.PartitionOf([]byte(key))
		switch {
		case errors.Is(err, eos.ErrNotHeld):
			unavailable(w, "eoshttp: the processor has not read its input's partitions yet")
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set(PartitionHeader, strconv.Itoa(int(part)))
		value, ok, err := view.Lookup([]byte(key))
		switch {
		case errors.Is(err, eos.ErrNotHeld) && restoring(p, part):
			unavailable(w, "eoshttp: the key's partition is restoring here")
		case errors.Is(err, eos.ErrNotHeld):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusMisdirectedRequest)
			_ = json.NewEncoder(w).Encode(struct {
				Partition int32 `json:"partition"`
			}{part})
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		case !ok:
			http.Error(w, "eoshttp: no value", http.StatusNotFound)
		default:
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Cache-Control", "no-store")
			_, _ = w.Write(value)
		}
	})
}

// restoring reports whether p restores (or is about to restore) part.
func restoring(p *eos.Processor, part int32) bool {
	for _, ps := range p.Health().Restoring {
		if slices.Contains(ps, part) {
			return true
		}
	}
	return false
}

func unavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, msg, http.StatusServiceUnavailable)
}
