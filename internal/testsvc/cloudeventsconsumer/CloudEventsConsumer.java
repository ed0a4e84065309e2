import io.cloudevents.CloudEvent;
import io.cloudevents.rocketmq.RocketMqMessageFactory;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The consumer the tests read through testsvc.ReadCloudEventsWithJavaSDK: it reads every
 * message of a topic with RocketMQ's Java client, from the first offset, and has the
 * CloudEvents Java SDK's RocketMQ binding (cloudevents-rocketmq) read each as a CloudEvent.
 *
 * <p>Usage: java -cp CLASSPATH CloudEventsConsumer.java NAMESRV TOPIC GROUP COUNT SECONDS
 *
 * <p>It prints one JSON line per message on stdout, what the binding read (or why it could
 * not) beside the message's own properties, and exits once COUNT distinct eventIds have
 * come, with 0, or after SECONDS, with 1.
 *
 * <p>The binding's factory has two readers: one of a MessageView of rocketmq-client-java,
 * which talks gRPC to a RocketMQ Proxy, and one of a message's content type, properties
 * and body, which this one calls. The test broker runs no proxy, so the messages come
 * through the remoting client; their user properties are what a MessageView's would be
 * (the client's system properties are left out).
 */
public class CloudEventsConsumer {
    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: CloudEventsConsumer NAMESRV TOPIC GROUP COUNT SECONDS");
            System.exit(2);
        }
        String namesrv = args[0], topic = args[1], group = args[2];
        int want = Integer.parseInt(args[3]);
        long deadline = System.nanoTime() + Long.parseLong(args[4]) * 1_000_000_000L;

        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(group);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.start();
        Set<String> seen = new HashSet<>();
        try {
            while (seen.size() < want && System.nanoTime() < deadline) {
                for (MessageExt m : consumer.poll(500)) {
                    seen.add(String.valueOf(m.getProperty("eventId")));
                    System.out.println(line(m));
                }
                System.out.flush();
            }
        } finally {
            consumer.shutdown();
        }
        if (seen.size() < want) {
            System.err.printf("%d of %d distinct events arrived%n", seen.size(), want);
            System.exit(1);
        }
    }

    /** line is the JSON line of one message. */
    static String line(MessageExt m) {
        Map<String, String> props = new HashMap<>(m.getProperties());
        props.keySet().removeIf(MessageConst.STRING_HASH_SET::contains);
        Map<String, Object> out = new TreeMap<>();
        out.put("msgId", m.getMsgId());
        out.put("eventId", props.get("eventId"));
        out.put("eventType", props.get("eventType"));
        out.put("bizNo", props.get("bizNo"));
        Map<String, Object> ce = new TreeMap<>();
        props.forEach((k, v) -> {
            if (k.startsWith("CE_")) {
                ce.put(k, v);
            }
        });
        out.put("ceProperties", ce);
        try {
            CloudEvent ev = RocketMqMessageFactory
                .createReader(props.get("CE_contenttype"), props, m.getBody())
                .toEvent();
            out.put("specversion", ev.getSpecVersion().toString());
            out.put("id", ev.getId());
            out.put("type", ev.getType());
            out.put("source", ev.getSource() == null ? null : ev.getSource().toString());
            if (ev.getTime() != null) {
                out.put("time", ev.getTime().toString());
                out.put("timeMillis", ev.getTime().toInstant().toEpochMilli());
            }
            out.put("datacontenttype", ev.getDataContentType());
            if (ev.getData() != null) {
                out.put("data", Base64.getEncoder().encodeToString(ev.getData().toBytes()));
            }
            out.put("extensions", new ArrayList<Object>(new TreeSet<>(ev.getExtensionNames())));
        } catch (RuntimeException e) {
            out.put("error", e.toString());
        }
        return json(out);
    }

    /** json writes strings, numbers, lists and maps of them as JSON. */
    static String json(Object v) {
        if (v == null) {
            return "null";
        }
        if (v instanceof Number) {
            return v.toString();
        }
        StringBuilder b = new StringBuilder();
        if (v instanceof Map) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) {
                    b.append(',');
                }
                first = false;
                b.append(json(String.valueOf(e.getKey()))).append(':').append(json(e.getValue()));
            }
            return b.append('}').toString();
        }
        if (v instanceof List) {
            b.append('[');
            boolean first = true;
            for (Object e : (List<?>) v) {
                if (!first) {
                    b.append(',');
                }
                first = false;
                b.append(json(e));
            }
            return b.append(']').toString();
        }
        String s = v.toString();
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
