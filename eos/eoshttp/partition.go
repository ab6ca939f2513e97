package eoshttp

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/eoskit/eoskit/eos"
)

// errNoJSON is a render's value json.Marshal refused.
var errNoJSON = errors.New("eoshttp: the partition's value is no JSON")

// RenderFunc turns one input partition of a processor's committed state
// into the value Partition answers as JSON: it reads the partition with
// view.ScanPartition (or Windows, Sessions or Lookup), each of which
// fails with a *eos.NotHeldError for a partition this instance does not
// hold or restores, and returns that error as it came (not
// StateView.Get, which answers "no value" there).
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
//     does not run or waits for its assignment, before it learnt its
//     input's partitions, or when the owner a request was forwarded to
//     did not answer;
//   - 421 (or, with [Forward], the owner's answer, relayed) when another
//     instance holds it, or none is known to;
//   - 400 for a partition that is not a decimal number, 404 for one the
//     input does not have, 500 when render fails otherwise (the error is
//     not shown: log it in render).
//
// Every answer for a partition number carries it in the header
// Eoskit-Partition, and every answer Cache-Control: no-store. Partitions
// spread keys by their hash, so a page that adds them up must have every
// partition's 200 before it shows a sum: one missing is a partial sum,
// not a smaller one. Each request reads the whole partition under the
// view's read lock (commits wait meanwhile), unless given [Cache], which
// renders a partition once per committed change of its state: give it
// when many read. It panics if src keeps no state, as Handler does.
func Partition(src Source, render RenderFunc, opts ...Option) http.Handler {
	return handler(src, opts, func(w http.ResponseWriter, r *http.Request, o *options) {
		raw := r.PathValue("partition")
		p, err := strconv.ParseInt(raw, 10, 32)
		if err != nil || p < 0 || strings.TrimLeft(raw, "0123456789") != "" {
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
		rendered := func() ([]byte, error) {
			value, err := render(view, part)
			if err != nil {
				return nil, err
			}
			body, err := json.Marshal(value)
			if err != nil {
				return nil, errNoJSON
			}
			return append(body, '\n'), nil
		}
		var body []byte
		if o.cache != nil {
			body, err = o.cache.answer(view, part, rendered)
		} else {
			body, err = rendered()
		}
		var notHeld *eos.NotHeldError
		switch {
		case errors.As(err, &notHeld) && notHeld.Partition == part:
			o.notHeld(w, r, src, notHeld, nil)
		case errors.Is(err, eos.ErrNotHeld):
			o.notHeld(w, r, src, &eos.NotHeldError{Partition: part}, nil)
		case errors.Is(err, errNoJSON):
			http.Error(w, "eoshttp: the partition's value is no JSON", http.StatusInternalServerError)
		case err != nil:
			http.Error(w, "eoshttp: the partition could not be read", http.StatusInternalServerError)
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(body)
		}
	})
}
