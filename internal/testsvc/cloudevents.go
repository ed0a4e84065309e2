package testsvc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// MavenEnv names the variable holding the Maven command (default mvn), as
// scripts/rocketmq.sh reads it. Java is $JAVA_HOME/bin/java, or java on PATH.
const MavenEnv = "MVN"

// JavaCloudEvent is one line of the cloudeventsconsumer program: one message of a topic as the
// CloudEvents Java SDK read it by the RocketMQ binding, beside the message's own properties.
type JavaCloudEvent struct {
	MsgID string `json:"msgId"`
	// EventID, EventType and BizNo are the message's eventId, eventType and bizNo properties.
	EventID   string `json:"eventId"`
	EventType string `json:"eventType"`
	BizNo     string `json:"bizNo"`
	// CEProperties are the message's user properties named CE_..., as they came.
	CEProperties map[string]string `json:"ceProperties"`
	// Error is why the binding could not read the message as a CloudEvent; the fields below
	// are then empty.
	Error string `json:"error"`

	// What the binding read (io.cloudevents.CloudEvent's getters).
	SpecVersion     string `json:"specversion"`
	ID              string `json:"id"`
	Type            string `json:"type"`
	Source          string `json:"source"`
	Time            string `json:"time"`       // OffsetDateTime.toString
	TimeMillis      *int64 `json:"timeMillis"` // the time, in milliseconds since the epoch
	DataContentType string `json:"datacontenttype"`
	Data            []byte `json:"data"` // the event data's bytes (base64 in the line)
	// Extensions are the names of the extension attributes it found.
	Extensions []string `json:"extensions"`
}

// ReadCloudEventsWithJava reads topic from its first offset in a Java process (the
// cloudeventsconsumer program beside this file: RocketMQ's Java client, and the CloudEvents
// Java SDK's core under a reader written to the RocketMQ binding, resolved by Maven), until n
// distinct eventIds have come, and returns what it printed for every message. It fails t if
// they have not come within timeout, and skips it (or fails it, under
// OUTBOX_REQUIRE_SERVICES=1) without Java or Maven, or when Maven cannot resolve the SDK.
func ReadCloudEventsWithJava(t testing.TB, topic string, n int, timeout time.Duration) []JavaCloudEvent {
	t.Helper()
	ns := RocketMQNameServer(t)
	jvm := need(t, cloudEventsJVM)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	home := t.TempDir() // the client's logs go under user.home
	cmd := exec.CommandContext(ctx, jvm.java, "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Djava.net.preferIPv4Stack=true", "-Duser.home="+home, "-cp", jvm.classpath,
		filepath.Join(cloudEventsConsumerDir(), "CloudEventsConsumer.java"),
		ns, topic, UniqueTable("cg"), fmt.Sprint(n), fmt.Sprint(int(timeout.Seconds())))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var events []JavaCloudEvent
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("{")) {
			continue // the client's own chatter
		}
		var ev JavaCloudEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatalf("cloudevents consumer: a line that is not JSON: %v\n%s", err, line)
		}
		events = append(events, ev)
	}
	if runErr != nil {
		t.Fatalf("cloudevents consumer: %v (%d lines read)\n%s", runErr, len(events), tail(stderr.String(), 40))
	}
	return events
}

// RequireCloudEventsJava skips t (or fails it, under OUTBOX_REQUIRE_SERVICES=1) unless
// [ReadCloudEventsWithJava] can run: Java is there, and Maven resolves the consumer's jars.
// For a test to call before it does any work.
func RequireCloudEventsJava(t testing.TB) {
	t.Helper()
	need(t, cloudEventsJVM)
}

// cloudEventsConsumerDir is the directory of the Java consumer and its pom.xml.
func cloudEventsConsumerDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "cloudeventsconsumer")
}

// javaConsumer is how to run the Java consumer: the java command and its classpath.
type javaConsumer struct{ java, classpath string }

// cloudEventsJVM finds Java and has Maven resolve the consumer's dependencies (into ~/.m2),
// once per test process.
var cloudEventsJVM = sync.OnceValues(func() (javaConsumer, error) {
	java := "java"
	if home := os.Getenv("JAVA_HOME"); home != "" {
		java = filepath.Join(home, "bin", "java")
	}
	if _, err := exec.LookPath(java); err != nil {
		return javaConsumer{}, fmt.Errorf("no Java for the CloudEvents Java SDK's consumer (set JAVA_HOME, or put java on PATH): %w", err)
	}
	mvn := os.Getenv(MavenEnv)
	if mvn == "" {
		mvn = "mvn"
	}
	if _, err := exec.LookPath(mvn); err != nil {
		return javaConsumer{}, fmt.Errorf("no Maven to resolve the CloudEvents Java SDK (set %s, or put mvn on PATH): %w", MavenEnv, err)
	}
	dir, err := os.MkdirTemp("", "outbox-cloudevents-")
	if err != nil {
		return javaConsumer{}, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "classpath.txt")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, mvn, "-q", "-B", "-f", filepath.Join(cloudEventsConsumerDir(), "pom.xml"),
		"dependency:build-classpath", "-Dmdep.outputFile="+out)
	if log, err := cmd.CombinedOutput(); err != nil {
		return javaConsumer{}, fmt.Errorf("could not resolve the CloudEvents Java SDK and RocketMQ's Java client with Maven: %w\n%s", err, tail(string(log), 40))
	}
	cp, err := os.ReadFile(out)
	if err != nil {
		return javaConsumer{}, err
	}
	if len(bytes.TrimSpace(cp)) == 0 {
		return javaConsumer{}, errors.New("maven resolved an empty classpath for the CloudEvents consumer")
	}
	return javaConsumer{java: java, classpath: strings.TrimSpace(string(cp))}, nil
})

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
