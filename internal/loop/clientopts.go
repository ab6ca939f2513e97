package loop

import (
	"context"
	"fmt"
	"reflect"

	"github.com/twmb/franz-go/pkg/kgo"
)

// PartitionsFunc is the shape of franz-go's partition callbacks.
type PartitionsFunc = func(context.Context, *kgo.Client, map[string][]int32)

// UserHooks are the partition callbacks a user passed through a runner's
// ClientOptions. The runner sets callbacks of its own, which would replace
// them (franz-go keeps one of each); it calls the user's after its own
// instead.
type UserHooks struct {
	Assigned, Revoked, Lost PartitionsFunc
}

// Chain returns the callback that runs ours, then the user's (if any).
func Chain(ours, users PartitionsFunc) PartitionsFunc {
	if users == nil {
		return ours
	}
	return func(ctx context.Context, cl *kgo.Client, parts map[string][]int32) {
		ours(ctx, cl, parts)
		users(ctx, cl, parts)
	}
}

// probeGroup stands for "no group given" in the client ReadUserOptions
// builds, which needs one to accept group options.
const probeGroup = "eoskit-probe-no-group"

// ReadUserOptions looks at the franz-go options a user passed through a
// runner's ClientOptions, in a client it builds and closes without
// connecting. It returns the user's partition callbacks, to chain, and an
// error naming the first option the runner owns (owned lists them by name:
// "ConsumerGroup", "ConsumeTopics", "ConsumeRegex", "ConsumePartitions",
// "TransactionalID", "AdjustFetchOffsetsFn") with the runner's option to
// use instead (instead maps the former to the latter).
func ReadUserOptions(opts []kgo.Opt, instead map[string]string) (UserHooks, error) {
	probe, err := kgo.NewClient(append([]kgo.Opt{kgo.ConsumerGroup(probeGroup), kgo.ConsumeTopics(probeGroup)}, opts...)...)
	if err != nil {
		return UserHooks{}, err
	}
	defer probe.Close()
	set := map[string]bool{
		"ConsumerGroup":        probe.OptValue(kgo.ConsumerGroup) != probeGroup,
		"ConsumeTopics":        !reflect.DeepEqual(probe.OptValue(kgo.ConsumeTopics), []string{probeGroup}),
		"ConsumeRegex":         probe.OptValue(kgo.ConsumeRegex) == true,
		"ConsumePartitions":    !isEmpty(probe.OptValue(kgo.ConsumePartitions)),
		"TransactionalID":      probe.OptValue(kgo.TransactionalID) != "",
		"AdjustFetchOffsetsFn": !isNil(probe.OptValue(kgo.AdjustFetchOffsetsFn)),
	}
	for _, name := range []string{"ConsumerGroup", "ConsumeTopics", "ConsumeRegex", "ConsumePartitions", "TransactionalID", "AdjustFetchOffsetsFn"} {
		if use, owned := instead[name]; owned && set[name] {
			return UserHooks{}, fmt.Errorf("kgo.%s is the runner's to set: %s", name, use)
		}
	}
	hooks := UserHooks{}
	hooks.Assigned, _ = probe.OptValue(kgo.OnPartitionsAssigned).(PartitionsFunc)
	hooks.Revoked, _ = probe.OptValue(kgo.OnPartitionsRevoked).(PartitionsFunc)
	hooks.Lost, _ = probe.OptValue(kgo.OnPartitionsLost).(PartitionsFunc)
	return hooks, nil
}

func isNil(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Func, reflect.Map, reflect.Pointer, reflect.Slice, reflect.Interface:
		return r.IsNil()
	}
	return false
}

func isEmpty(v any) bool {
	if isNil(v) {
		return true
	}
	r := reflect.ValueOf(v)
	return r.Kind() == reflect.Map && r.Len() == 0
}
