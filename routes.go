package outbox

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/go-outbox/outbox/internal/eventrules"
)

// Routes says where each event of a store goes: the topic it names ([EventInput.Topic]),
// else the topic of its event type (ByType), else Topic. The store resolves an event's
// topic when it writes it ([Tx.InsertEvent]) and stores it on the row, so that every path
// that reads the row (the publisher, the relay, [Admin], outboxctl and the console) sees
// where it goes; a row written by a plain SQL INSERT that names no topic is resolved by the
// same routes when it is claimed, and the claim stores the topic on it. The topics are a
// bounded set: an event that names a topic outside it is refused at insert, and a row that
// names one (written by hand) is dead-lettered at its send, never sent elsewhere. See
// docs/routing.md.
type Routes struct {
	// Topic is the default topic: where an event goes that names none and whose event type
	// has no route. Defaults to "ORDER_EVENT_TOPIC".
	Topic string

	// Topics are the other topics an event may name, or ByType may route to. Defaults to
	// none.
	Topics []string

	// ByType routes by event type: an event that names no topic and whose type is a key goes
	// to that topic, Topic or one of Topics. Defaults to none.
	ByType map[string]string
}

// TopicOf returns the topic ev goes to by r: its own ([Event.Topic]), else its event
// type's, else the default. A store applies it at insert, and to a row written without a
// topic when it claims it; the binlog relay applies it to the rows it reads.
func (r Routes) TopicOf(ev Event) string {
	if ev.Topic != "" {
		return ev.Topic
	}
	if t, ok := r.ByType[ev.EventType]; ok {
		return t
	}
	return cmp.Or(r.Topic, topicDefault)
}

// routing is a checked [Routes]: the set of topics, the default first, and the routes by
// type.
type routing struct {
	def    string
	set    []string // every topic, def first
	known  map[string]bool
	byType map[string]string
}

// routes checks r and returns it as a routing. The topic names follow RocketMQ's rule.
func (r Routes) routing() (routing, error) {
	def := cmp.Or(r.Topic, topicDefault)
	if err := checkTopicName("Routes.Topic", def); err != nil {
		return routing{}, err
	}
	rt := routing{def: def, set: []string{def}, known: map[string]bool{def: true}}
	for i, t := range r.Topics {
		if err := checkTopicName(fmt.Sprintf("Routes.Topics[%d]", i), t); err != nil {
			return routing{}, err
		}
		if rt.known[t] {
			return routing{}, fmt.Errorf("%w: Routes names topic %q twice", ErrInvalidConfig, t)
		}
		rt.known[t] = true
		rt.set = append(rt.set, t)
	}
	for _, typ := range slices.Sorted(maps.Keys(r.ByType)) {
		t := r.ByType[typ]
		switch {
		case typ == "":
			return routing{}, fmt.Errorf("%w: Routes.ByType has an empty event type", ErrInvalidConfig)
		case !rt.known[t]:
			return routing{}, fmt.Errorf("%w: Routes.ByType routes %q to %q, which is neither Routes.Topic nor one of Routes.Topics (%s)",
				ErrInvalidConfig, typ, t, strings.Join(rt.set, ", "))
		}
	}
	if len(r.ByType) > 0 {
		rt.byType = maps.Clone(r.ByType)
	}
	return rt, nil
}

// config returns the Routes rt was made of.
func (rt routing) config() Routes {
	return Routes{Topic: rt.def, Topics: slices.Clone(rt.set[1:]), ByType: maps.Clone(rt.byType)}
}

// resolve returns the topic of an event that names topic and is of type typ.
func (rt routing) resolve(topic, typ string) string {
	if topic != "" {
		return topic
	}
	if t, ok := rt.byType[typ]; ok {
		return t
	}
	return rt.def
}

// check refuses a topic an event names that is not in the set.
func (rt routing) check(topic string) error {
	if topic == "" || rt.known[topic] {
		return nil
	}
	return fmt.Errorf("%w: topic %.140q is not one of the store's topics (%s)", ErrInvalidEvent, topic, strings.Join(rt.set, ", "))
}

// checkTopicName checks a topic name by the broker's rule (its TopicValidator): 1 to 127
// letters, digits, '_', '-', '%' or '|', and not one of its own topics.
func checkTopicName(field, topic string) error {
	if err := eventrules.TopicName(topic); err != nil {
		return fmt.Errorf("%w: %s %w", ErrInvalidConfig, field, err)
	}
	return nil
}
