package goid_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/go-outbox/outbox/internal/goid"
)

func TestIDTellsGoroutinesApart(t *testing.T) {
	here := goid.ID()
	assert.NotZero(t, here)
	assert.Equal(t, here, goid.ID(), "the same goroutine, the same id")
	other := make(chan uint64)
	go func() { other <- goid.ID() }()
	there := <-other
	assert.NotZero(t, there)
	assert.NotEqual(t, here, there)
}
