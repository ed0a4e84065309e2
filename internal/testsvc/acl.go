package testsvc

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/go-outbox/outbox/internal/rmqlock"
)

// codeUpdateAndCreateTopic is RocketMQ's request code that creates or updates a topic on a
// broker.
const codeUpdateAndCreateTopic = 17

// The variables naming a second RocketMQ cluster, whose broker checks credentials and
// permissions (ACL 2.0): OUTBOX_ROCKETMQ_ACL=1 bash scripts/rocketmq.sh start runs one
// (with its own directory and ports) and prints them.
const (
	RocketMQACLNameServerEnv = "OUTBOX_TEST_ROCKETMQ_ACL_NAMESRV"
	RocketMQACLBrokerEnv     = "OUTBOX_TEST_ROCKETMQ_ACL_BROKER"
	// The credentials of a user granted Pub and Sub on every topic and Sub on every group.
	RocketMQACLAccessKeyEnv = "OUTBOX_TEST_ROCKETMQ_ACL_ACCESS_KEY"
	RocketMQACLSecretKeyEnv = "OUTBOX_TEST_ROCKETMQ_ACL_SECRET_KEY"
	// The credentials of the cluster's super user, who creates topics.
	RocketMQACLAdminKeyEnv    = "OUTBOX_TEST_ROCKETMQ_ACL_ADMIN_ACCESS_KEY"
	RocketMQACLAdminSecretEnv = "OUTBOX_TEST_ROCKETMQ_ACL_ADMIN_SECRET_KEY"
)

// ACLCluster is the test RocketMQ cluster with ACL 2.0 on.
type ACLCluster struct {
	NameServer string
	Broker     string
	// User may consume and produce; Admin is the super user.
	User, Admin primitive.Credentials
}

// RocketMQACL returns the test cluster with ACL 2.0 on, skipping or failing t if there is
// none.
func RocketMQACL(t testing.TB) ACLCluster {
	t.Helper()
	c := ACLCluster{
		NameServer: os.Getenv(RocketMQACLNameServerEnv),
		Broker:     os.Getenv(RocketMQACLBrokerEnv),
		User: primitive.Credentials{AccessKey: os.Getenv(RocketMQACLAccessKeyEnv),
			SecretKey: os.Getenv(RocketMQACLSecretKeyEnv)},
		Admin: primitive.Credentials{AccessKey: os.Getenv(RocketMQACLAdminKeyEnv),
			SecretKey: os.Getenv(RocketMQACLAdminSecretEnv)},
	}
	if c.NameServer == "" || c.Broker == "" || c.User.AccessKey == "" || c.Admin.AccessKey == "" {
		missing(t, fmt.Errorf("no RocketMQ cluster with ACL on: set %s, %s and the credentials' variables "+
			"(OUTBOX_ROCKETMQ_ACL=1 bash scripts/rocketmq.sh start runs one and prints them)", RocketMQACLNameServerEnv, RocketMQACLBrokerEnv))
	}
	return c
}

// NewTopic creates a fresh topic of 4 queues on the cluster's broker, as its super user,
// and waits until its route can be read.
func (c ACLCluster) NewTopic(t testing.TB, prefix string) string {
	t.Helper()
	topic := UniqueTable(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The Go client's admin neither signs CreateTopic nor reads its response's code: the
	// request is made here, signed by the super user.
	cl := rmqlock.Client{Credentials: c.Admin}
	if _, err := cl.Call(ctx, c.Broker, codeUpdateAndCreateTopic, map[string]string{
		"topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
		"topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false",
	}, nil); err != nil {
		t.Fatalf("create topic %s on the ACL broker %s: %v", topic, c.Broker, err)
	}
	for {
		route, err := cl.Route(ctx, []string{c.NameServer}, topic)
		if err == nil && len(route) > 0 {
			return topic
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s has no route after 60 s: %v", topic, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
