package a

import (
	"errors"
	"fmt"
	"log/slog"
)

var errBase = errors.New("base")

type myErr struct{}

func (*myErr) Error() string { return "mine" }

func f(err error, name string, n int) {
	_ = fmt.Errorf("%w: %v", errBase, err)                    // want `fmt.Errorf formats the error err with %v \(verb 2\)`
	_ = fmt.Errorf("open %s: %s", name, err)                  // want `formats the error err with %s`
	_ = fmt.Errorf("%w: %w", errBase, err)                    // two causes, both wrapped
	_ = fmt.Errorf("%d%%: %w", n, err)                        // %% takes no argument
	_ = fmt.Errorf("%*d %v", n, n, err)                       // want `the error err with %v`
	_ = fmt.Errorf("%[2]v %[1]w", err, errBase)               // want `the error errBase with %v`
	_ = fmt.Errorf("type %T", err)                            // the type is not the cause
	_ = fmt.Errorf("%v", &myErr{})                            // want `the error &myErr{} with %v`
	_ = fmt.Errorf("%s", name)                                // not an error
	_ = fmt.Errorf("%q: %v", err.Error(), n)                  // want `fmt.Errorf formats err.Error\(\), the error's text \(verb 1\): wrap err with %w`
	_ = fmt.Errorf("%s", name+": failed")                     // a string
	slog.Error("failed", "err", err)                          // the error itself
	slog.Error("failed", "err", err.Error())                  // want `log/slog is given err.Error\(\) as text`
	slog.Warn(fmt.Sprintf("failed: %v", err))                 // want `formatted as text by fmt.Sprintf`
	slog.Default().Info("x", slog.String("err", err.Error())) // want `log/slog is given err.Error\(\) as text`
	slog.Default().Info("x", slog.Any("err", err))
}
