package eos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// newClient builds the franz-go client for cfg and checks it against cfg's
// semantics, so that a pass-through option that weakens the preset fails
// here.
func newClient(c *config, roles ...Role) (*kgo.Client, error) {
	cl, err := kgo.NewClient(c.kgoOpts(roles...)...)
	if err != nil {
		return nil, c.clientOptionsError(err)
	}
	if err := c.semantics.Check(cl, roles...); err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

// IdempotentProducer writes records with acks=all and idempotence: a retry
// after a lost acknowledgement never writes a record twice, and records to
// one partition stay in the order they were produced. It does not make
// writes to several partitions atomic; [TransactionalProducer] does.
type IdempotentProducer struct {
	cl       *kgo.Client
	logger   *slog.Logger
	promises promises // ProduceAsync records whose promise has not returned
}

// NewIdempotentProducer returns an idempotent producer. It accepts
// [Brokers] (required), [Logger] and [ClientOptions].
func NewIdempotentProducer(opts ...IdempotentOption) (*IdempotentProducer, error) {
	c := newConfig(opts)
	if err := c.requireBrokers(); err != nil {
		return nil, err
	}
	c.semantics = ExactlyOnce // acks=all + idempotence, without a transactional id
	cl, err := newClient(c, RoleProducer)
	if err != nil {
		return nil, err
	}
	return &IdempotentProducer{cl: cl, logger: c.logger}, nil
}

// Produce writes rs and waits until every one is acknowledged or failed. It
// returns nil if all were written, else the failures joined, each a
// *ProduceError.
func (p *IdempotentProducer) Produce(ctx context.Context, rs ...*kgo.Record) error {
	var errs []error
	for _, res := range p.cl.ProduceSync(ctx, rs...) {
		if res.Err != nil {
			errs = append(errs, produceError(res.Record, res.Err))
		}
	}
	return errors.Join(errs...)
}

// ProduceAsync writes r and calls promise (which may be nil) with its
// outcome, a *ProduceError on failure. It blocks only while the client's
// buffer is full.
func (p *IdempotentProducer) ProduceAsync(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	p.promises.add()
	p.cl.Produce(ctx, r, func(r *kgo.Record, err error) {
		defer p.promises.done()
		if err != nil {
			err = produceError(r, err)
		}
		if promise != nil {
			promise(r, err)
		}
	})
}

// Flush waits until every record produced so far is acknowledged or
// failed, and its promise has returned: also the records franz-go fails
// before buffering them (over MaxBufferedBytes, say), whose promises its
// own Flush does not wait for.
func (p *IdempotentProducer) Flush(ctx context.Context) error {
	return p.promises.settle(ctx, p.cl.Flush)
}

// ProducerID returns the producer id and epoch the broker assigned, for
// diagnostics (kadm's DescribeProducers shows the same pair on the broker).
// It initialises them if nothing was produced yet.
func (p *IdempotentProducer) ProducerID(ctx context.Context) (id int64, epoch int16, err error) {
	id, epoch, err = p.cl.ProducerID(ctx)
	if err != nil {
		return id, epoch, fmt.Errorf("eos: producer id: %w", err)
	}
	return id, epoch, nil
}

// Client returns the underlying franz-go client, for metrics and admin use.
// Producing through it directly bypasses nothing, but closing it closes the
// producer.
func (p *IdempotentProducer) Client() *kgo.Client { return p.cl }

// Close flushes nothing: call Flush first to wait for records in flight.
func (p *IdempotentProducer) Close() { p.cl.Close() }
