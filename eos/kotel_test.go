package eos_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// Tracing through franz-go's kotel plugin, passed as a client option: a
// producer upstream starts each input's trace; the processor's client
// continues it when it fetches the input (a receive span), the handler
// opens a process span from the input and hands its context to the output,
// and the output's publish span joins the same trace, whose context the
// output carries on to the next consumer. Before the processor kept the
// output's own Context, it replaced it, and every output started a trace
// of its own.
func TestKotelSpanLinksInputToOutput(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(2), k.NewTopic(2)
	group := integration.UniqueName(t, "g")

	spans := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	// Trace context travels in the records' headers (W3C traceparent).
	tracer := kotel.NewTracer(kotel.TracerProvider(provider), kotel.TracerPropagator(propagation.TraceContext{}))
	hooks := kgo.WithHooks(kotel.NewKotel(kotel.WithTracer(tracer)).Hooks()...)

	const n = 50
	producer := k.Client(kgo.DefaultProduceTopic(in), hooks)
	var inputs []*kgo.Record
	for i := range n {
		inputs = append(inputs, &kgo.Record{Key: []byte{byte(i)}, Value: []byte("v")})
	}
	if err := producer.ProduceSync(context.Background(), inputs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	upstream := map[byte]trace.TraceID{} // each input's trace, by key
	for _, r := range inputs {
		upstream[r.Key[0]] = trace.SpanContextFromContext(r.Context).TraceID()
	}

	h := func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		ctx, span := tracer.WithProcessSpan(r)
		defer span.End()
		return []*kgo.Record{{Topic: out, Key: r.Key, Value: r.Value, Context: ctx}}, nil
	}
	progress := followCommitted(t, k, out)
	p := startProcessor(t, h, append(processorOpts(k, group, in, "0"), eos.ClientOptions(hooks))...)
	waitFor(t, time.Minute, "every output", func() bool { return progress.n.Load() >= n })
	if err := p.stop(t); err != nil {
		t.Fatalf("processor stopped with %v", err)
	}

	// The trace each output carries on: what its consumer would continue.
	joined := 0
	for _, r := range k.ReadAll(out, kgo.ReadCommitted(), verifyTimeout) {
		ctx := propagation.TraceContext{}.Extract(context.Background(), kotel.NewRecordCarrier(r))
		got := trace.SpanContextFromContext(ctx).TraceID()
		if want := upstream[r.Key[0]]; !want.IsValid() || got != want {
			t.Errorf("output of input %d is in trace %s, want its input's trace %s", r.Key[0], got, want)
			continue
		}
		joined++
	}
	if joined != n {
		t.Fatalf("%d of %d outputs joined their input's trace", joined, n)
	}

	// And the spans between: receive, process and publish in the input's
	// trace, each publish a child of a process span.
	kinds := map[string]int{}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byID[s.SpanContext().SpanID()] = s
	}
	for _, s := range spans.Ended() {
		kinds[s.Name()]++
		if s.Name() == out+" publish" {
			parent, ok := byID[s.Parent().SpanID()]
			if !ok || parent.Name() != in+" process" {
				t.Errorf("publish span of an output has parent %v, want the input's process span", s.Parent().SpanID())
			}
		}
	}
	if kinds[in+" receive"] < n || kinds[out+" publish"] < n {
		t.Errorf("spans: %v; want a receive span per input and a publish span per output", kinds)
	}
}
