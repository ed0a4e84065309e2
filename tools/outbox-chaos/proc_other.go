//go:build !linux

package main

import (
	"os"
	"syscall"
)

// childAttr: without Linux's parent-death signal, publishers and consumers outlive a chaos
// run killed hard.
func childAttr() *syscall.SysProcAttr { return nil }

// pauseSignals: the database fault pauses no consumer but on Linux.
func pauseSignals() (pause, resume os.Signal) { return nil, nil }
